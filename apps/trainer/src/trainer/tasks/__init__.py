"""Tasks: the built-in generated ones, the file-backed ones (GSM8K, MATH rows) and `data` (rows of any
shape, `trainer.tasks.rows`), and every installed package's, by name through the entry-point group
`trainer.tasks` (`trainer.tasks.registry`); user code as `module:function` or `file.py:function`."""

from trainer.tasks.data_files import DataError, read_rows
from trainer.tasks.data_task import data
from trainer.tasks.files import FILE_TASKS, FileTask, file_task, gsm8k, math
from trainer.tasks.generated import arithmetic, carryless_sum, countdown, multiply
from trainer.tasks.number_words import number_words
from trainer.tasks.reasoning_gym import reasoning_gym
from trainer.tasks.registry import ENTRY_POINT_GROUP, TASKS, TaskError, task_factory
from trainer.tasks.task import Task, sized_lengths, split_for_warm_start, split_heldout

__all__ = [
    "DataError", "ENTRY_POINT_GROUP", "FILE_TASKS", "FileTask", "TASKS", "Task", "TaskError", "arithmetic", "data",
    "carryless_sum", "countdown", "file_task", "gsm8k", "math", "multiply", "number_words", "read_rows",
    "reasoning_gym", "sized_lengths", "split_for_warm_start", "split_heldout", "task_factory",
]
