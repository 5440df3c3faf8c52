"""Temperature scaling's fit, one job per module (docs/design.md section 4):

* :mod:`.chunks`: the data as :class:`~.chunks.Chunk` s sized to ATen's grain;
* :mod:`.validation`: label checks per chunk, positioned errors for non-finite sums;
* :mod:`.distributed`: the process group check and the all-reduce of a pass's sums;
* :mod:`.sums`: :func:`~.sums.temperature_pass`, one float64 pass (fixed-order sums, threads,
  DDP), read through :class:`~.sums.TemperatureSums`;
* :mod:`.solvers`: Newton on ``log beta`` (vectorised over groups) and LBFGS judged by Newton's
  tests, and the degenerate-set messages;
* :mod:`.fit`: :func:`~.fit.fit_temperature` (in memory), :func:`~.fit.solve_temperature`
  (streamed);
* :mod:`.group`: :func:`~.group.fit_group_temperatures` (per group, shrunk).

None of these names is public (the scalers of :mod:`torchcal.scaling` are); this package
exports nothing itself.
"""

__all__: list[str] = []
