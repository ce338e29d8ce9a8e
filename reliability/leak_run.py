"""Run one release in this process with a planted (canary) seed, for the leak test.

    python -m reliability.leak_run SPEC.yaml SEED_FILE

The seed is injected by patching ``kepsilon.tasks.perturb.new_seed`` here, in the test's own process:
production code has no hook for it. Prints the flow run id as JSON on the last line of stdout.
"""

import json
import sys
from pathlib import Path
from unittest.mock import patch


def main(spec_path: str, seed_file: str) -> int:
    seed = Path(seed_file).read_bytes()
    from kepsilon.flows.release import governed_release
    from kepsilon.flows.spec import load_spec

    with patch("kepsilon.tasks.perturb.new_seed", lambda: seed):
        manifest = governed_release(load_spec(spec_path))
    print(json.dumps({"flow_run_id": manifest["execution"]["flow_run_id"], "seed_commitment": manifest["seed_commitment"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
