"""The test project's only app: orders, and the tasks that follow one."""
