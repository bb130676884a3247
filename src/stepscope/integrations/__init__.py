"""Trainer integrations: callbacks that record a framework's training with stepscope.

``stepscope.integrations.lightning.StepscopeCallback`` (``pip install 'stepscope[lightning]'``)
and ``stepscope.integrations.transformers.StepscopeCallback``
(``pip install 'stepscope[transformers]'``). Importing this package imports neither framework;
importing an adapter without its framework refuses ``extra_missing`` with the install line.
Both derive from :class:`~stepscope.integrations.trainer.WatchingCallback` and drive the
framework-neutral core, :class:`~stepscope.integrations.trainer.TrainerWatch`.
"""

from stepscope.integrations.trainer import (
    IntegrationStoppedWarning,
    ProbePlan,
    TrainerWatch,
    WatchingCallback,
)

__all__ = ["IntegrationStoppedWarning", "ProbePlan", "TrainerWatch", "WatchingCallback"]
