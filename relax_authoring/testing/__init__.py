"""Contract test kit for plugin authors.

One call checks a component against the plugin contract, choosing the checks by its kind
and its *declared* capabilities (a declaration is verified where it can be)::

    from relax_authoring.testing import check_contract
    from relax_myalgo.plugin import relax_register_estimators

    def test_contract():
        check_contract(relax_register_estimators()[0])

or, with the pytest plugin that relax-core installs (entry point ``relax_contract``)::

    def test_contract(relax_contract):
        relax_contract(spec)

What is checked (each failure is collected; one ``AssertionError`` lists them all):

- every kind: the spec is well formed (name, one-line summary, source, ``api_version``),
  its factory resolves to a callable, its parameter schema is a frozen dataclass whose
  every field has a default and ``help`` and whose defaults (and the ``params`` given)
  pass the declared bounds, its capabilities are an instance of the kind's capability
  type;
- estimators: built with a :class:`~relax_core.config.RunConfig` that satisfies its
  declared capabilities (each capability-table row's ``satisfy`` values), which the
  validator must accept (so contradictory declarations, ``requires_x`` with
  ``forbids_x`` or ``sync_only`` with ``supports_fully_async``, fail), ``compute_advantages`` and
  ``policy_loss`` run on a synthetic batch (groups by ``group_index`` in shuffled order,
  uneven lengths, an empty response, an all-equal group, an unscored reward, NaN and
  1e9 garbage in the masked slots of every token input): outputs have the documented
  shapes and dtypes, are finite at valid positions, advantages are 0 at masked ones, and
  the garbage changes neither the loss nor its gradient (which is 0 at masked positions
  and not identically 0 elsewhere); with bfloat16 inputs the loss and gradient stay
  finite; a critic estimator's ``value_loss`` is checked like the policy loss;
- ``supports_context_parallel``: the same loss and gradient (to 1e-6, float64 inputs)
  when each sequence is split across 2 gloo ranks, with the rank group passed as
  ``PolicyLossInput.process_group`` and global denominators in the reduction;
- ``sync_only``: the validator refuses it in async mode (``--fully-async --launcher ray
  --max-staleness 1``); ``supports_fully_async``: it accepts it;
- corrections: shapes, finite values, masked garbage irrelevant to value and gradient,
  and importance weights that carry no gradient (for corrections that do not need top-k
  log-probs, the corrected loss of a loss tensor independent of ``log_probs`` must have
  no gradient w.r.t. ``log_probs``); a correction declaring ``supports_context_parallel``
  gives the same loss and gradient applied to the two halves of each sequence (global
  token count) as to the whole (``CorrectionInput`` carries no process group, so the
  halves run in one process);
- reward scorers: return a finite float or ``None`` for a few inputs (or refuse an input
  they cannot interpret with a ``ValueError`` that says why);
- reward post-processors: keep the batch's shapes and dtypes;
- environments: built, an episode of a toy row steps (at most ``--max-turns`` 8 times) and
  every step returns a :class:`~relax_core.environments.Reply` whose messages are
  ``{"role", "content"}`` dicts with string content and whose reward is finite or ``None``;
  an environment that does not declare ``multi_turn`` is done after its first turn;
- estimators declaring ``supports_loss_mask_holes``: the same responses with environment
  tokens inserted (holes in ``loss_mask``, NaN/1e9 garbage in them, ``response_lengths``
  counting them) give the same advantages and returns at the model tokens, 0 in the holes,
  and the same reduced loss and gradient;
- engines, backends, data sources: spec-level checks only (building them needs models).

The 2-rank check starts two worker subprocesses once per process (a few seconds: each
imports torch) and reuses them for every component checked.
"""

from relax_authoring.testing.contract import check_contract, config_for

__all__ = ["check_contract", "config_for"]
