"""The virtual waiting room's logic; `app.py` holds only the routes and Lambda entry points."""
