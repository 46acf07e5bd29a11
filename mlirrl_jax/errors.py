"""The project's error types: what a user's input, settings or files can cause.

`Error` is their base. The command line reports one as a one-line message and exit status 2;
any other exception is a defect and keeps its traceback. Every subclass is also a ValueError
(`UnknownProgramError` a KeyError), so code that caught those before still does:

- `ConfigError`: a setting, flag or argument out of range or in conflict with another;
- `programs.ir.ProgramError`, `suites.UnknownProgramError`: a program the project cannot take;
- `schedule.ScheduleError`, `env.state.EncodingError`: a schedule or program that does not fit;
- `store.StoreError`, `integrity.IntegrityError`, `agent.checkpoint.CheckpointError`,
  `agent.run.RunError`, `runfolder.RunFolderError`: files that cannot be used as asked;
- `collect.BackendError`, `search.SearchError`, `optimize.OptimizeError`,
  `validation.ValidationError`, `measure.profile.UnknownMachineError`,
  `measure.reference.ReferenceUnsupported`: a job that cannot run as asked.
"""

from __future__ import annotations


class Error(Exception):
    """Input, settings or files the project cannot use; the message names why."""


class ConfigError(Error, ValueError):
    """A setting, flag or argument that cannot be used as given."""
