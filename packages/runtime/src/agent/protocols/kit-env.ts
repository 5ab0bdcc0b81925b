import { joinSearchPath } from '../../launch/launch-env.js'

/** The agent kit's libraries (the jsonl helpers) ahead of the launch's search paths. */
export function kitLibraryEnv(base: Readonly<Record<string, string>>): Record<string, string> {
  return {
    PYTHONPATH: joinSearchPath('/opt/cairn/python', base.PYTHONPATH),
    NODE_PATH: joinSearchPath('/opt/cairn/node', base.NODE_PATH),
  }
}
