pytest_plugins = ["offtake_testbed.pytest_plugin", "offtake_testbed.pytest_plugin_kube"]
