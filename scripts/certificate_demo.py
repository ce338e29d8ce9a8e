"""`make certificate-demo`: the demo release's certificate, as an officer gets it, rendered in headless Chromium.

Runs ``kepsilon release`` on releases/paper-synthetic.yaml with ``certificate: {utility_target: GENDER}``
and ``population: {sampling_fraction: 0.1}`` added, in a throw-away store and folders; then, as a user
does: ``kepsilon audit certificate RELEASE --verify FILE`` on the certificate the release wrote (must
verify), on a copy with one byte changed (must not), and ``kepsilon audit certificate RELEASE --pdf``.
Finally Debian's ``chromium`` takes a full-page screenshot of the certificate into
docs/certificate-demo.png (``--out`` to write it elsewhere). Exits 1 if any step does not behave.
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "releases" / "paper-synthetic.yaml"
KEPSILON = str(Path(sys.executable).parent / "kepsilon")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars"]


def demo_spec(folder: Path) -> Path:
    spec = yaml.safe_load(SPEC.read_text(encoding="utf-8"))
    spec["release_id"] = "paper-synthetic-demo"
    spec["source"]["path"] = str((SPEC.parent / spec["source"]["path"]).resolve())
    for quasi in spec["roles"]["k_quasi"]:
        quasi["hierarchy"] = str((SPEC.parent / quasi["hierarchy"]).resolve())
    spec["output_dir"] = str(folder / "out")
    spec["certificate"] = {"utility_target": "GENDER"}
    spec["population"] = {"sampling_fraction": 0.1}
    path = folder / "spec.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    return path


def step(what: str, command: list[str], env: dict, expect: int) -> str:
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    print(f"$ {' '.join(Path(c).name if c == KEPSILON else c for c in command[:6])} ... → exit {result.returncode}")
    print((result.stdout + result.stderr).strip()[-600:])
    if result.returncode != expect:
        sys.exit(f"{what}: expected exit {expect}, got {result.returncode}")
    return result.stdout


def page_height(html: Path, env: dict, profile: Path) -> int:
    """The document's full height in CSS pixels (Chromium's DOM dump of a script that writes it)."""
    probe = html.parent / ".height-probe.html"
    probe.write_text(html.read_text(encoding="utf-8").replace(
        "</body>", "<script>document.title = 'H' + document.documentElement.scrollHeight;</script></body>"), encoding="utf-8")
    try:
        dump = subprocess.run(["chromium", *FLAGS, f"--user-data-dir={profile}", "--window-size=1000,800", "--dump-dom",
                               probe.as_uri()], capture_output=True, text=True, env=env, timeout=300).stdout
    finally:
        probe.unlink()
    marker = dump.find("<title>H")
    return int(dump[marker + 8: dump.index("<", marker + 8)]) if marker >= 0 else 5000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "certificate-demo.png")
    arguments = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="kepsilon-certificate-demo-"))
    try:
        env = {**os.environ, "PREFECT_HOME": str(folder / "prefect"), "KEPSILON_AUDIT_DB": str(folder / "audit.db"),
               "KEPSILON_SEED_KEY_FILE": str(folder / "seed.key"), "KEPSILON_REPORTS_DIR": str(folder / "reports"),
               "KEPSILON_DEFAULT_CAP": "10",
               # A loaded machine starts the local Prefect server slowly.
               "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "300")}
        env.pop("PREFECT_API_URL", None)
        step("the demo release", [KEPSILON, "release", str(demo_spec(folder))], env, 0)
        html = folder / "reports" / "paper-synthetic-demo" / "certificate.html"
        if not html.exists():
            sys.exit(f"the release wrote no certificate at {html}")
        step("verify", [KEPSILON, "audit", "certificate", "paper-synthetic-demo", "--verify", str(html)], env, 0)
        changed = bytearray(html.read_bytes())
        changed[changed.index(b"records were")] = ord("R")
        tampered = folder / "tampered.html"
        tampered.write_bytes(bytes(changed))
        step("verify one changed byte", [KEPSILON, "audit", "certificate", "paper-synthetic-demo", "--verify", str(tampered)], env, 2)
        step("print to PDF", [KEPSILON, "audit", "certificate", "paper-synthetic-demo", "--pdf"], env, 0)
        pdf = html.with_name("certificate.pdf")
        print(f"PDF: {pdf.stat().st_size:,} bytes, mode {oct(pdf.stat().st_mode & 0o777)}")
        profile = folder / "chromium-profile"
        height = page_height(html, env, profile)
        arguments.out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(["chromium", *FLAGS, f"--user-data-dir={profile}", f"--window-size=1000,{height}",
                        f"--screenshot={arguments.out.resolve()}", html.as_uri()], capture_output=True, env=env, timeout=300,
                       check=True)
        print(f"screenshot ({height} px high): {arguments.out}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
