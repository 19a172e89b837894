"""The PostgreSQL backend: connect.py (connections, pools, errors, redaction), schema.py
(the tables and their migrations)."""
