//! Task drivers: run a task's process and report on it.
