import steps_module

steps_module.run(7)
