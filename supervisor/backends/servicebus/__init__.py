"""The Azure Service Bus backend: backend, lease, receiver pool, error mapping."""
