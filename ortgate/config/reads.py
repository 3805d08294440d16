"""Every file a command reads, listed in one place: no output of any command may be, replace or (a folder) hold one
of them (ortgate.cli.output.check_outputs applies that rule to this list)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ortgate.config.policy import Policy


def policy_reads(policy: Policy | None) -> list[Path]:
    """The policy file, every base its `extends` chain reads, its calibration file and the custom-op libraries its
    session names (relative to the policy file that names them)."""
    if policy is None:
        return []
    from ortgate.config.throughput import calibration_file

    reads = list(policy.chain)
    calibration = calibration_file(policy)
    if calibration is not None:
        reads.append(calibration)
    libraries = policy.get("session", "custom_op_libraries")
    for i, library in enumerate(libraries if isinstance(libraries, list) else []):
        # As the runner resolves it: relative to the policy file that names it (an absolute path replaces the folder)
        reads.append(Path(policy.where("session", "custom_op_libraries", i).file).parent
                     / Path(str(library)).expanduser())
    return reads


def model_reads(model: Path, external_data: Iterable[str], genai_config: Path | None = None,
                config: Path | None = None) -> list[Path]:
    """The model file, the weight files it names (beside the model as named and, for a symlinked model, beside the
    file it points to; never opened by the linter, the user's files all the same) and genai_config.json."""
    folders = dict.fromkeys((model.parent, model.resolve().parent))
    locations = list(external_data)
    reads = [model, *(folder / location for folder in folders for location in locations)]
    return reads + [p for p in (genai_config, config) if p is not None]
