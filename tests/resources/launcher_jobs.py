"""Jobs the run launcher's tests launch: importable by module path, as a code location's are."""

import os
import sys
import time

from dagster import In, Nothing, OpExecutionContext, in_process_executor, job, op


@op
def note_the_worker(context: OpExecutionContext) -> None:
    """Records the worker's pid and its parent's, and whether the template had imported the fleet's
    definitions (the worker itself never imports the module that does), for the test to read back."""
    context.log.info(f"worker pid {os.getpid()} parent {os.getppid()}")
    context.log.info(f"template imported the definitions: {'resources.warm_definitions' in sys.modules}")
    context.log.info(f"worker niceness {os.getpriority(os.PRIO_PROCESS, 0)}")


@job(executor_def=in_process_executor)
def quick() -> None:
    note_the_worker()


@op
def wait_a_minute() -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        time.sleep(0.05)


@op(ins={"after": In(Nothing)})
def never_reached() -> None:
    raise AssertionError("the run should have ended before this op")


@job(executor_def=in_process_executor)
def slow() -> None:
    never_reached(after=wait_a_minute())
