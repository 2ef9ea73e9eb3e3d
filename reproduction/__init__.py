"""Paper experiments over the library: sweeps, tables and figures.

* `table2`: VIRTUAL's Table II / Figs. 2-3 hyperparameter grid (resumable) and its report;
* `virtual_tables`: VIRTUAL's sparse updates (Table III) and SNR CDFs (Fig. 4);
* `pfnm`: the PFNM paper's one-shot, depth, streaming and sensitivity experiments;
* `fola_figures`: FOLA's first-round accuracy (Fig. 2) and learning curves (Fig. 3);
* `_runs`: what they share (run records and their reuse, `metrics.csv`, figures,
  markdown tables, flag help texts).

The launchers (`launchers/virtual_*.py`, `pfnm_*.py`, `fola_*.py`) are thin absl
shells around these modules.
"""
