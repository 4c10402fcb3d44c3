"""Serves the bundled servables (servables/ beside this script), or a Hugging Face model directory: gRPC on
127.0.0.1:5500 and RESTful on 127.0.0.1:1500 by default. The same as `mindspore-serving serve`, with the same flags:

    python serving_server.py [--grpc 127.0.0.1:5500] [--rest 127.0.0.1:1500] [--servables add,lenet] [...]
    python serving_server.py --model <hf_dir> [--served_model_name NAME] [...]

`python serving_server.py --help` lists every flag (mindspore_serving/cli/serve.py defines them).
"""

import os

from mindspore_serving.cli import serve

if __name__ == "__main__":
    # relative paths resolve against this script's directory, as MindSpore Serving's scripts do
    serve.main(prog="serving_server.py", base_directory=os.path.dirname(os.path.abspath(__file__)))
