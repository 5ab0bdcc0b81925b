// `@cairn/runtime/doctor`: the host checks alone, for `cairn doctor` (which loads nothing else of
// the runtime) and for the server's start.
export {
  checkHost,
  describeFailure,
  type HostCheck,
  type HostCheckArea,
  type HostCheckNeed,
  type HostCheckOptions,
  type HostReport,
  hostRefusal,
} from './doctor.js'
