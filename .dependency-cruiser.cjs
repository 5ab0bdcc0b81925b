/**
 * The package boundaries, checked in CI (`npm run check`): the server reaches the runtime only
 * through its port (`@cairn/runtime/port`), no package reaches into one above it, and no import circles.
 */
module.exports = {
  forbidden: [
    {
      name: 'server-uses-runtime-port',
      comment:
        'packages/server uses the runtime only through @cairn/runtime/port (RuntimePort: IDs, never host paths). ' +
        'The exceptions: the composition root (server.ts) and local-runtime.ts, which builds the Runtime and its LocalRuntimePort for it and for cairn node.',
      severity: 'error',
      from: {
        path: '^packages/server/src/',
        pathNot: '^packages/server/src/(server|local-runtime)\\.ts$',
      },
      to: { path: '^packages/runtime/', pathNot: '^packages/runtime/(src|dist)/port/' },
    },
    {
      name: 'runtime-knows-no-server',
      comment: 'The runtime is below the server: it never imports it (nor the SDK, CLI or console).',
      severity: 'error',
      from: { path: '^packages/runtime/' },
      to: { path: '^packages/(server|sdk|cli|console)/' },
    },
    {
      name: 'protocol-is-the-bottom',
      comment: 'The wire contract depends on no other package of ours.',
      severity: 'error',
      from: { path: '^packages/protocol/' },
      to: { path: '^packages/(runtime|server|sdk|cli|console|agent-kit)/' },
    },
    {
      name: 'no-import-circles',
      comment:
        'No module reaches itself through its imports (type imports count): a circle means two files ' +
        'are one responsibility split wrongly, or a shared type lives in the wrong one; move it to a leaf.',
      severity: 'error',
      from: {},
      to: { circular: true },
    },
    {
      name: 'cairn-packages-resolve',
      comment:
        'Our packages resolve through their built exports (run after `npm run build`): one that does not ' +
        'resolve would pass every rule above unchecked.',
      severity: 'error',
      from: {},
      to: { couldNotResolve: true, path: '^@cairn/' },
    },
  ],
  options: {
    doNotFollow: { path: 'node_modules' },
    exclude: { path: '(^|/)(dist|node_modules)/.*\\.js$' },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: 'tsconfig.base.json' },
    enhancedResolveOptions: {
      exportsFields: ['exports'],
      conditionNames: ['import', 'types', 'default'],
      extensions: ['.ts', '.d.ts', '.js'],
    },
  },
}
