"""Entry point of a front-end process (started by the master; what operators see in `ps`)."""

import argparse

from mindspore_serving.frontend_process.process import main

if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--master_address", required=True)
    args = parser.parse_args()
    main(args.index, args.master_address)
