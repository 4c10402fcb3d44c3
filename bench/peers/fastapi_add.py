"""Peer for bench/classic.py: a plain FastAPI `async def` route doing the 2x2 add in-process with numpy.

    python bench/peers/fastapi_add.py --port 8001

Same URL, body and reply as our classic REST route:
POST /model/add:add_common  {"instances": [{"x1": [[..]], "x2": [[..]]}]} -> {"instances": [{"y": [[..]]}]}
"""

import argparse

import numpy as np
import uvicorn
from fastapi import Body, FastAPI

app = FastAPI()


@app.post("/model/add:add_common")
async def add_common(body: dict = Body(...)):
    results = []
    for instance in body["instances"]:
        x1 = np.asarray(instance["x1"], np.float32)
        x2 = np.asarray(instance["x2"], np.float32)
        results.append({"y": (x1 + x2).tolist()})
    return {"instances": results}


@app.get("/health")
async def health():
    return {"status": "ok"}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8001)
    args = parser.parse_args()
    print(f"fastapi peer listening on {args.host}:{args.port}", flush=True)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
        lifespan="off",
    )


if __name__ == "__main__":
    main()
