"""Tasks: the built-in generated ones, the file-backed ones (GSM8K, MATH rows) and `data` (rows of any
shape, `trainer.tasks.rows`), by name."""

from collections.abc import Callable

from trainer.tasks.data_files import DataError, read_rows
from trainer.tasks.data_task import data
from trainer.tasks.files import FILE_TASKS, file_task, gsm8k, math
from trainer.tasks.generated import arithmetic, carryless_sum, countdown, multiply
from trainer.tasks.number_words import number_words
from trainer.tasks.reasoning_gym import reasoning_gym
from trainer.tasks.task import Task, split_heldout

TASKS: dict[str, Callable[..., Task]] = {
    "arithmetic": arithmetic, "countdown": countdown, "multiply": multiply, "gsm8k": gsm8k, "math": math,
    "number_words": number_words, "data": data, "reasoning_gym": reasoning_gym,
}
"""Built-in generated tasks, and file-backed ones that need `options.data`."""

__all__ = [
    "DataError", "FILE_TASKS", "TASKS", "Task", "arithmetic", "data", "carryless_sum", "countdown", "file_task", "gsm8k",
    "math", "multiply", "number_words", "read_rows", "reasoning_gym", "split_heldout",
]
