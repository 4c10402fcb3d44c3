"""A front-end process: serves the public ports beside the master (master/frontend_processes.py)."""
