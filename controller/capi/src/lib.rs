//! The Cluster API in-place update extension (hooks `CanUpdateMachine`,
//! `CanUpdateMachineSet`, `UpdateMachine`), served by `inplace-controller capi`.
