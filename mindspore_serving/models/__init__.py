"""Reference models served by mindspore_serving (see llama/)."""
