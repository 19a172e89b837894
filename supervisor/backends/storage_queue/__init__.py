"""The Azure Storage Queue backend: backend, lease, error mapping."""
