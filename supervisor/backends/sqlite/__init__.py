"""The embedded SQLite backend: backend, lease, schema, owners, queues, retention, admin queries."""
