"""The server the attack suite attacks (started once for tests/security, conftest.py): add and the tiny LLM,
two front ends (the master and a front-end process, so that what travels to front-end processes is checked too),
an API key from a file, the model-repository and admin groups behind a key of their own, metrics open, model
control left at its default (off), and a short read timeout."""

import numpy as np

KEY = "s3cret-key-for-tests"
PROMPT = "And the king of"
X = np.ones((2, 2), np.float32)
ADD_BODY = {"instances": [{"x1": X.tolist(), "x2": X.tolist()}]}
TRIES = 8  # each check that should hold on both front ends, on new connections: both see some
READ_TIMEOUT = 2.0
AUTH = {"Authorization": f"Bearer {KEY}"}
ADMIN_KEY = "admin-key-for-tests"
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}
