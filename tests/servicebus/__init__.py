"""In-process AMQP 1.0 test broker for the Service Bus backend, and its tests."""
