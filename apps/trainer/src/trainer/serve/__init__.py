"""`trainer serve`: the paged engine behind an OpenAI-compatible endpoint (see `app`), and what
agent rollouts build on it (`agents`)."""

from trainer.serve.app import Running, make_app, serve_in_thread
from trainer.serve.responses import Served
from trainer.serve.model import EngineOptions, served_folder, served_run

__all__ = ["EngineOptions", "Running", "Served", "make_app", "serve_in_thread", "served_folder", "served_run"]
