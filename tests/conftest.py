pytest_plugins = ["deltacheck.harness.pytest_plugin"]
