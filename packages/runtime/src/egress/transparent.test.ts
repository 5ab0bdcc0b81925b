import { describe, expect, it } from 'vitest'
import { dnsPatterns, forwarderCommand } from './transparent.js'

describe('transparent egress', () => {
  it('gives the stub DNS the allowlist host patterns, without ports, methods or IP literals', () => {
    const policy = {
      allow: [
        'API.example.com',
        '*.npmjs.org',
        'git.example.com:8443',
        { host: 'upload.example.com', methods: ['PUT'] },
        '10.0.0.5:8080',
        'api.example.com:443',
        '[::1]:80',
      ],
    }
    expect(dnsPatterns(policy)).toEqual([
      'api.example.com',
      '*.npmjs.org',
      'git.example.com',
      'upload.example.com',
    ])
  })

  it('starts the forwarder in transparent mode only where the driver redirects', () => {
    const policy = { allow: ['a.example', '*.b.example'] }
    expect(forwarderCommand(['python3', 'agent.py'], true, policy)).toEqual([
      'python3',
      '/opt/cairn/egress/forward.py',
      '--transparent',
      'a.example,*.b.example',
      '--',
      'python3',
      'agent.py',
    ])
    expect(forwarderCommand(['node', 'x.js'], false, policy)).toEqual([
      'python3',
      '/opt/cairn/egress/forward.py',
      '--',
      'node',
      'x.js',
    ])
  })
})
