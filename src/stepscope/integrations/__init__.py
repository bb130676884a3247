"""Trainer integrations: callbacks that record a framework's training with stepscope.

``stepscope.integrations.lightning.StepscopeCallback`` (``pip install 'stepscope[lightning]'``)
and ``stepscope.integrations.transformers.StepscopeCallback``
(``pip install 'stepscope[transformers]'``). Importing this package imports neither framework;
importing an adapter without its framework refuses ``extra_missing`` with the install line.
The shared driver is :class:`~stepscope.integrations.session.TrainerSession`.
"""

from stepscope.integrations.session import IntegrationStoppedWarning, ProbePlan, TrainerSession

__all__ = ["IntegrationStoppedWarning", "ProbePlan", "TrainerSession"]
