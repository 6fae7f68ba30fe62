"""The exit codes of ``relax train``, in one place (the CLI, the launcher and the loop use
these; the docs list them)."""

#: the run finished (or the dry run found nothing wrong)
EXIT_OK = 0
#: bad input, found before any model loaded: the message lists every problem and its fix
EXIT_BAD_INPUT = 2
#: stopped after --max-skipped-steps consecutive steps with a non-finite loss or gradient
EXIT_SKIPPED = 3
#: a training worker died (Ray); the message names the checkpoint to resume from
EXIT_WORKER_DIED = 4
#: a checkpoint could not be written; the previous complete one is intact
EXIT_CHECKPOINT_FAILED = 5
#: the LoRA adapter did not reach the rollout engine (its log-probs stayed the base model's)
EXIT_ADAPTER_NOT_REACHED = 6
#: the environment's prompt() raised or ran past --env-timeout; the last complete checkpoint is intact
EXIT_ENVIRONMENT_FAILED = 7
#: interrupted by Ctrl-C (first: checkpoint saved; second: aborted)
EXIT_INTERRUPTED = 130
