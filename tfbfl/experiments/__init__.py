"""Paper experiments over the library: sweeps, tables and figures."""
