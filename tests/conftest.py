pytest_plugins = ["offtake_testbed.pytest_plugin"]
