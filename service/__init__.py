"""ckpt-advisor HTTP service: FastAPI over ckpt_core, no logic of its own."""
