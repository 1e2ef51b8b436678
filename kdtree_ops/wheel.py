"""A binary wheel: the package with one built library inside, named, pinned and tagged for the torch it was built
against.

`python -m kdtree_ops build --wheel --archs "80;90a;120"` takes the library for those targets from the JIT cache
(compiling it when it is not there: a build the test suite made is not compiled again) and writes the wheel that
`pip wheel .` would (hatchling; pyproject.toml's [project] table and wheel target: the package, the C++/CUDA
sources in kdtree_ops/_csrc for the JIT fallback, the entry points) with kdtree_ops/_prebuilt/{library, build.json}
added (prebuilt.py loads them). It is written here, not by pip: the build needs no network and no build backend
(a GPU machine without either builds it too); compile_tests/test_wheel.py checks it against hatchling's.

- version `0.1.0+torch2.14.1.cu130`: the local label names the torch build it serves (`.cpu` for a CPU torch), as
  FlashInfer's and sgl-kernel's CUDA wheels do;
- `Requires-Dist: torch==2.14.1`: pip cannot tell the CUDA and CPU builds of one torch release apart by version
  (PyPI's carry no local label, and `==2.14.1` takes any of them), so the loader checks the exact
  `torch.__version__` and `torch.version.cuda`;
- tag `py3-none-<platform>`: the library calls no Python API (checked here, linkage.python_api_symbols) and is
  dlopened by torch.ops.load_library, not imported as a CPython extension module, so every Python that runs that
  torch loads it. The platform is this machine's (`linux_x86_64`), with no manylinux audit.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import sysconfig
import zipfile
from pathlib import Path

from . import build, linkage, prebuilt

# The [project] fields this writer renders; another one (authors, urls, dynamic, ...) must be taught here first,
# or the binary wheel would silently lack what `pip wheel .` gives.
_PROJECT_FIELDS = {"name", "version", "description", "readme", "requires-python", "license", "dependencies",
                   "optional-dependencies", "scripts", "entry-points"}
_DATE = (2020, 2, 2, 0, 0, 0)  # fixed, as hatchling's: the same inputs give the same wheel


def local_label(torch_build: dict) -> str:
    """"torch2.14.1.cu130" for torch 2.14.1+cu130 with CUDA 13.0; "torch2.14.1.cpu" for a CPU torch."""
    public = torch_build["torch"].split("+")[0]
    variant = "cu" + torch_build["cuda"].replace(".", "") if torch_build["cuda"] else "cpu"
    return f"torch{public}.{variant}"


def torch_requirement(torch_build: dict) -> str:
    """"torch==2.14.1": the release, whose every build (CUDA variants, CPU) pip takes; the loader checks which."""
    return "torch==" + torch_build["torch"].split("+")[0]


def platform_tag() -> str:
    return re.sub(r"[-.]", "_", sysconfig.get_platform())


def write(library: Path, out_dir: Path) -> Path:
    """Writes the binary wheel holding `library` (a complete build in the cache, build.json beside it) into
    out_dir; returns its path. Needs a checkout (pyproject.toml beside csrc/)."""
    checkout = build.source_root().parent
    if not (checkout / "pyproject.toml").is_file():
        raise RuntimeError(f"kdtree_ops: a wheel is built from a checkout; {checkout} has no pyproject.toml "
                           "(run `python -m kdtree_ops build --wheel` from the repository root)")
    uses_python = linkage.python_api_symbols(library)
    if uses_python:
        raise RuntimeError(f"kdtree_ops: {library.name} uses the Python API ({', '.join(uses_python[:5])}): it would "
                           "serve only the Python it was built with, and the wheel's py3-none tag and the build key "
                           "(build._source_key) assume it serves every Python")
    meta = json.loads((library.parent / prebuilt.MANIFEST).read_text())
    project, target = _pyproject(checkout)
    name = re.sub(r"[-_.]+", "_", project["name"]).lower()
    version = f"{project['version']}+{local_label(meta)}"
    tag = f"py3-none-{platform_tag()}"
    files = _package_files(checkout, target)
    files[f"kdtree_ops/{prebuilt.PREBUILT_DIR.name}/{library.name}"] = library.read_bytes()
    files[f"kdtree_ops/{prebuilt.PREBUILT_DIR.name}/{prebuilt.MANIFEST}"] = json.dumps(meta, indent=1).encode()
    info = f"{name}-{version}.dist-info"
    files[f"{info}/METADATA"] = _metadata(checkout, project, version, torch_requirement(meta)).encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: kdtree_ops.wheel\nRoot-Is-Purelib: false\n"
                              f"Tag: {tag}\n").encode()
    files[f"{info}/entry_points.txt"] = _entry_points(project).encode()
    record = [f"{path},sha256={_digest(data)},{len(data)}" for path, data in files.items()] + [f"{info}/RECORD,,"]
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{name}-{version}-{tag}.whl"
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as wheel:
        for path, data in files.items():  # RECORD last, as the wheel format recommends
            entry = zipfile.ZipInfo(path, date_time=_DATE)
            entry.external_attr = (0o755 if path.endswith(".so") else 0o644) << 16
            entry.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(entry, data)
    tmp.replace(out)
    return out


def _pyproject(checkout: Path) -> tuple[dict, dict]:
    """([project], [tool.hatch.build.targets.wheel]) of the checkout's pyproject.toml; a [project] field this
    writer does not render is an error naming it."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        try:
            import tomli as tomllib
        except ImportError as exc:
            raise RuntimeError("kdtree_ops: building a wheel reads pyproject.toml, which needs Python 3.11 or later "
                               "(tomllib) or the tomli package (pip install tomli)") from exc
    data = tomllib.loads((checkout / "pyproject.toml").read_text())
    project = data["project"]
    unknown = sorted(set(project) - _PROJECT_FIELDS)
    if unknown:
        raise RuntimeError(f"kdtree_ops: pyproject.toml's [project] has {', '.join(unknown)}, which kdtree_ops/wheel.py "
                           "does not write into a wheel yet: add it there (and to its test, compile_tests/test_wheel.py)")
    return project, data.get("tool", {}).get("hatch", {}).get("build", {}).get("targets", {}).get("wheel", {})


def _package_files(checkout: Path, target: dict) -> dict[str, bytes]:
    """{path in the wheel: bytes}: the wheel target's packages and force-included folders, as hatchling packs them
    (without byte code, caches, or a _prebuilt/ folder a checkout never has)."""
    mapping = {package: package for package in target.get("packages", [])}
    mapping.update(target.get("force-include", {}))
    files = {}
    for source, dest in mapping.items():
        root = checkout / source
        if root.is_file():
            files[dest] = root.read_bytes()
            continue
        for path in sorted(root.rglob("*")):
            relative = path.relative_to(root)
            skip = {"__pycache__", prebuilt.PREBUILT_DIR.name} & set(relative.parts) or path.suffix == ".pyc"
            if path.is_file() and not skip:
                files[f"{dest}/{relative.as_posix()}"] = path.read_bytes()
    return files


def _metadata(checkout: Path, project: dict, version: str, torch_pin: str) -> str:
    """METADATA (core metadata 2.1): the project's fields, its torch requirement replaced by `torch_pin`."""
    requires = [r for r in project.get("dependencies", []) if not re.match(r"torch(?![\w-])", r)]
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {project['name']}",
        f"Version: {version}",
        f"Summary: {project.get('description', '')}",
    ]
    if "license" in project:
        lines.append(f"License: {project['license']['text']}")
    if "requires-python" in project:
        lines.append(f"Requires-Python: {project['requires-python']}")
    lines += [f"Requires-Dist: {r}" for r in sorted([*requires, torch_pin])]
    for extra, extra_requires in sorted(project.get("optional-dependencies", {}).items()):
        lines.append(f"Provides-Extra: {extra}")
        lines += [f"Requires-Dist: {r}; extra == '{extra}'" for r in sorted(extra_requires)]
    readme = project.get("readme")
    if readme is None:
        return "\n".join(lines) + "\n"
    if not isinstance(readme, str) or not readme.endswith(".md"):
        raise RuntimeError("kdtree_ops: wheel.py writes a Markdown readme given as a path only (readme = \"README.md\")")
    lines.append("Description-Content-Type: text/markdown")
    return "\n".join(lines) + "\n\n" + (checkout / readme).read_text()


def _entry_points(project: dict) -> str:
    groups = {"console_scripts": project.get("scripts", {}), **project.get("entry-points", {})}
    return "\n".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
                     for group, entries in groups.items() if entries)


def _digest(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
