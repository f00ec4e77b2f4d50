"""Print pip constraints that pin every dependency of pyproject.toml (the dev extra included) to
its lower bound, for `.ci/run --lowest`: the oldest versions the bounds promise, tested."""

import re
import sys
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the package supports it, this CI helper reads TOML with 3.11's module
    sys.exit("error: .ci/run --lowest needs Python 3.11 or newer (tomllib); run it with python3.11 or newer")

project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
for req in project["dependencies"] + project["optional-dependencies"]["dev"]:
    spec = req.split(";")[0]
    m = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(?:\[[^]]*\])?\s*.*?>=\s*([0-9][^,\s]*)", spec)
    if m and m.group(1) != "torch":  # torch: the README pins the build it installs
        print(f"{m.group(1)}=={m.group(2)}")
