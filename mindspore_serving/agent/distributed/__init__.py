"""The rank agents of `server.distributed`: `startup_agents` starts one process per local rank as ranks of a
MindSpore cluster; each loads its shard's MindIR graph and serves RankAgent.Predict to the distributed worker."""
