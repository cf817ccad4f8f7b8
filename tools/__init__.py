"""Developer tools kept out of the installed package: the SM80 coverage proof, the launch
configs it checks, the cubin inventory, vLLM-on-SM80 stand-ins, running Triton as sm_80
PTX on a newer GPU, and the test harnesses (error budgets, poisoned memory, mutants,
required tiers). Importable as ``tools.*`` from the repository root."""
