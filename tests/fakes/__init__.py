"""In-process fakes of external services, reusable by unit and integration tests."""
