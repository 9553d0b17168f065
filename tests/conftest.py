pytest_plugins = ["communicator.pytest_plugin"]
