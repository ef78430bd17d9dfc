"""Builds the qparams package: the Python sources plus the message and stub modules
that protoc and gRPC's Python plugin generate from proto/ at build time, so that the
package cannot drift from the contract.

The same step serves `pip install ./client/python` and the CMake build, which runs
`setup.py build_py --build-lib <build>/python` to make the package importable from
the build tree.
"""

import pathlib
import shutil
import subprocess
import tempfile

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTO_ROOT = HERE.parent.parent / "proto"

# (source under proto/, path it is generated as). The health protocol is generated as
# qparams/_health/v1/health.proto: under its own path, grpc/health/v1, its modules would
# be grpc.health.v1.*, inside the grpcio package. Its wire names do not change.
PROTOS = [
    ("qparams/v1/qparams.proto", "qparams/v1/qparams.proto"),
    ("grpc/health/v1/health.proto", "qparams/_health/v1/health.proto"),
]


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SystemExit(f"qparams: {name} not found; install Debian's {package}")
    return path


def generate(out_dir: pathlib.Path) -> None:
    """Generates the *_pb2.py and *_pb2_grpc.py modules of PROTOS under out_dir."""
    protoc = _tool("protoc", "protobuf-compiler")
    plugin = _tool("grpc_python_plugin", "protobuf-compiler-grpc")
    with tempfile.TemporaryDirectory() as staging:
        for source, target in PROTOS:
            src = PROTO_ROOT / source
            if not src.is_file():
                raise SystemExit(f"qparams: {src} not found; build from a qparams checkout")
            dst = pathlib.Path(staging, target)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
        subprocess.run(
            [protoc, f"--proto_path={staging}", f"--python_out={out_dir}",
             f"--grpc_python_out={out_dir}", f"--plugin=protoc-gen-grpc_python={plugin}"]
            + [target for _, target in PROTOS],
            check=True, cwd=staging)
    for _, target in PROTOS:
        package = out_dir / pathlib.Path(target).parent
        for d in [package, package.parent]:
            init = d / "__init__.py"
            if not init.exists():
                init.write_text("")


class BuildPyWithProtos(build_py):
    """build_py, then the generated modules beside the copied sources."""

    def run(self) -> None:
        super().run()
        generate(pathlib.Path(self.build_lib).resolve())


# The generated qparams.v1 and qparams._health packages come from BuildPyWithProtos.
setup(packages=["qparams", "qparams.torch"], cmdclass={"build_py": BuildPyWithProtos})
