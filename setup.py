from setuptools import find_packages, setup

setup(
    name="mindspore_serving",
    version="0.1.0",
    description="Serve MindSpore MindIR models and large language models over gRPC and HTTP",
    packages=find_packages(include=["mindspore_serving", "mindspore_serving.*"]),
    package_data={
        "mindspore_serving.proto": ["*.proto"],
        "mindspore_serving.models.llama": ["tiny/*.yaml", "tiny/*.json", "tiny/*.ckpt", "tiny/*.jinja", "README.md"],
    },
    python_requires=">=3.9",
    install_requires=[
        "mindspore>=2.10.0",
        "grpcio>=1.85.1",
        "grpcio-health-checking>=1.85.1",
        "protobuf>=7",
        "numpy>=2",
        "fastapi",
        "uvicorn",
        "orjson",
        "pydantic>=2",
        "pyyaml",
        "hpack>=4",
        "pillow",
        "psutil",
        "prometheus-client",
        "sse-starlette",
        "tokenizers",
        "safetensors",
        "jinja2",
    ],
)
