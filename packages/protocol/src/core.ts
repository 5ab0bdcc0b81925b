/**
 * `@cairn/protocol/core`: the part of the protocol clients need at run time — error codes, IDs,
 * event and status names, unknown-key messages — without TypeBox, whose ~730 modules would
 * otherwise be loaded (and its schemas built) by every `cairn` command that makes a request.
 * Types come from `@cairn/protocol` (erased at run time).
 */
export * from './errors.js'
export * from './ids.js'
export * from './names.js'
export * from './unknown-keys.js'
export * from './version.js'
