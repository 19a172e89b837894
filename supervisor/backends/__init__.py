"""Queue backends behind the Backend/Lease seam (see base.py)."""
