"""What a worker is: ``Worker`` (worker.py), and how its methods become group methods (register.py, dispatch.py)."""
