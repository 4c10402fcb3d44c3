"""The distributed worker of `server.distributed`: one process that holds no model itself, parses the rank
table, waits for the rank agents started by `startup_agents`, and runs the servable's model through them."""
