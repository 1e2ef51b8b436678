"""How the ops library links: the one C++ runtime it shares with torch, and no Python API.

The library is loaded by torch.ops.load_library (a dlopen) into a process where torch has loaded libstdc++; it must
take that runtime (check_linkage, share_cxx_runtime), and it calls no Python C API, so one build serves every
Python that runs the same torch (python_api_symbols: a binary wheel is tagged py3-none on that ground).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path


def share_cxx_runtime() -> None:
    """Puts the process's libstdc++.so.6 (loaded by torch) in the global symbol scope before the library loads.

    torch loads it privately (RTLD_LOCAL), and a library opened with dlopen looks a symbol up in the global
    scope first, then in itself, then in its dependencies: a C++ runtime symbol that the library defines too
    (a template instance the compiler emitted) would bind to the library's own copy, and its streams would then
    use another copy's locale facets. Made global, the one runtime wins every lookup.
    """
    import ctypes

    try:
        ctypes.CDLL("libstdc++.so.6", mode=os.RTLD_NOW | os.RTLD_GLOBAL | getattr(os, "RTLD_NOLOAD", 0))
    except OSError:  # not loaded in this process (another C++ runtime): nothing to share
        pass


# Symbols of the C++ runtime's streams and locales. Defined in (or bound inside) the library, they make it use
# a second copy of std::locale's facet ids, and formatting an integer (every TORCH_CHECK message with a number)
# reads another copy's facets: a crash instead of an error.
RUNTIME_SYMBOL = re.compile(r"^_ZN(?:K?So|K?Si|St6locale|St8ios_base|KSt7num_put|St7num_put|St15basic_stringbuf)")


def check_linkage(library: Path) -> None:
    """Fails the build when the library does not depend on libstdc++.so; warns when it defines stream symbols.

    Needs binutils (readelf, nm), which the link needed too, and checks nothing where they are missing. Stream
    or locale symbols defined in the library are harmless once share_cxx_runtime has run, so they only warn.
    """
    readelf, nm = shutil.which("readelf"), shutil.which("nm")
    if readelf is None or nm is None:
        return
    needed = subprocess.run([readelf, "-d", str(library)], capture_output=True, text=True).stdout
    defined = subprocess.run([nm, "-D", "--defined-only", str(library)], capture_output=True, text=True).stdout
    own = sorted({line.split()[-1] for line in defined.splitlines() if RUNTIME_SYMBOL.match(line.split()[-1])})
    if own:
        print(f"kdtree_ops: warning: {library.name} defines {len(own)} C++ stream/locale symbols of its own "
              f"(e.g. {', '.join(own[:3])}); they are bound to the process's libstdc++ at load", file=sys.stderr)
    if "libstdc++.so" not in needed:
        raise RuntimeError(
            f"kdtree_ops: the built library {library} does not depend on libstdc++.so (readelf -d): it carries a "
            "C++ runtime of its own, and error messages that format integers would crash the process instead of "
            "raising. Check the host compiler and linker (CXX, LDFLAGS, a -static-libstdc++ in the environment).")


def python_api_symbols(library: Path) -> list[str]:
    """The Python C API symbols the library needs from the process (nm -D: undefined Py*/_Py* symbols), and a
    libpython or libtorch_python it names among its needed libraries; [] for a library that runs under any Python."""
    readelf, nm = shutil.which("readelf"), shutil.which("nm")
    if readelf is None or nm is None:
        raise RuntimeError("kdtree_ops: binutils (readelf, nm) are needed to check the library's symbols; install "
                           "them (Debian: apt-get install binutils)")
    undefined = subprocess.run([nm, "-D", "--undefined-only", str(library)], capture_output=True, text=True,
                               check=True).stdout
    needed = subprocess.run([readelf, "-d", str(library)], capture_output=True, text=True, check=True).stdout
    python_libs = re.findall(r"\[(libpython[^\]]*|libtorch_python[^\]]*)\]", needed)
    return python_libs + sorted({line.split()[-1] for line in undefined.splitlines()
                                 if re.match(r"_?Py", line.split()[-1])})
