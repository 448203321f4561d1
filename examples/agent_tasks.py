"""Agent experience in a task buffer: several worker processes run multi-step "tasks" (text observations,
tool calls, rewards) and store every step in one shared buffer; the trainer queries by agent and task name
and samples whole tasks as TensorDicts.

    python examples/agent_tasks.py [--workers 4] [--tasks 8] [--steps 6]
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from objectrl_buffer.tasks import TaskReplayBuffer

TOOLS = ["search", "calculator", "browser", "python"]


def run_worker(buffer: TaskReplayBuffer, worker: int, tasks: int, steps: int) -> None:
    """One rollout worker: each task is a short conversation between a planner and a tool-using agent."""
    from objectrl_buffer.tasks import DataRow, Experience, ExpMeta

    rng = random.Random(worker)
    for t in range(tasks):
        task_id = f"worker{worker}-task{t}"
        task_name = "math" if t % 2 else "web_qa"
        rows = []
        for step in range(steps):
            agent = "planner" if step == 0 else "executor"
            tool = rng.choice(TOOLS)
            rows.append(
                DataRow(
                    ExpMeta(task_id, task_name, agent, step, time.time(), pre_agent=None if step == 0 else "planner"),
                    Experience(
                        state={"observation": f"step {step} of {task_name}: result of the last call"},
                        action={"tool_name": tool, "params": {"query": f"q{step}"}},
                        reward_t=rng.random(),
                        messages=[{"role": "user", "content": f"solve {task_id}"}],
                    ),
                )
            )
        buffer.store_batch(rows)  # one task at a time: readers never see half a task


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=4, help="writer processes (spawned), each runs --tasks tasks")
    parser.add_argument("--tasks", type=int, default=8, help="tasks per worker (web_qa and math in turn)")
    parser.add_argument("--steps", type=int, default=6, help="steps per task, each stored as one row")
    args = parser.parse_args()

    # after parsing: --help answers without loading torch
    from objectrl_buffer.tasks import QueryBuilder, SharedTaskStorage, TaskReplayBuffer, TensorDictConverter

    buffer = TaskReplayBuffer(SharedTaskStorage(max_capacity=10_000), seed=0)
    ctx = multiprocessing.get_context("spawn")  # also works with "fork" and "forkserver"
    workers = [ctx.Process(target=run_worker, args=(buffer, w, args.tasks, args.steps)) for w in range(args.workers)]
    for p in workers:
        p.start()
    for p in workers:
        p.join()
    print(f"stored {len(buffer)} steps of {args.workers * args.tasks} tasks")

    query = QueryBuilder().eq("exp_meta.agent_id", "executor").and_().eq("exp_meta.task_name", "math").build()
    print(f"executor steps in math tasks: {buffer.storage.size(query)}")
    batch = buffer.sample_task(query_condition=query, converter=TensorDictConverter(), batch_size=4)
    for td in batch:
        print(f"{td['task_id'][0]}: steps {td['step'].tolist()}, mean reward {td['reward_t'].mean():.3f}")
    print(batch[0])


if __name__ == "__main__":
    main()
