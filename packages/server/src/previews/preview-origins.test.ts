import { describe, expect, it } from 'vitest'
import { resolveConfig } from '../config.js'
import { checkPreviewDomain, PreviewOrigins, previewOfHost } from './preview-origins.js'

const ID = 'ses_0123456789abcdefghjk'

describe('preview origins', () => {
  it('gives each session port a host of its own, and reads it back from a Host header', () => {
    const origins = new PreviewOrigins('Previews.Example.Test.', 7071)
    expect(origins.originOf(ID, 8000)).toBe('http://8000-ses-0123456789abcdefghjk.previews.example.test:7071')
    expect(new PreviewOrigins('localhost', 80).originOf(ID, 3000)).toBe(
      'http://3000-ses-0123456789abcdefghjk.localhost',
    )
    const host = origins.hostOf(ID, 8000)
    expect(previewOfHost(`${host}:7071`, origins.domain)).toEqual({ sessionId: ID, port: 8000 })
    expect(previewOfHost(`${host.toUpperCase()}.`, origins.domain)).toEqual({ sessionId: ID, port: 8000 })
  })

  it('names no preview for hosts outside the domain, or that alias one', () => {
    for (const host of [
      undefined,
      '127.0.0.1:7071',
      'localhost:7071',
      'previews.example.test',
      `8000-ses-abc.previews.example.test.evil.test`,
      `8000-ses-abc.evilpreviews.example.test`,
      `x.8000-ses-abc.previews.example.test`,
      `08000-ses-abc.previews.example.test`,
      `0-ses-abc.previews.example.test`,
      `65536-ses-abc.previews.example.test`,
      `8000-ses_abc.previews.example.test`,
      `8000-agt-abc.previews.example.test`,
    ]) {
      expect(previewOfHost(host, 'previews.example.test'), host).toBeUndefined()
    }
  })

  it('wants a DNS name for the preview domain, and defaults the listener to the API port + 1', () => {
    for (const bad of ['127.0.0.1', '::1', 'a..b', '-x.test', 'x_y.test', ''])
      expect(() => checkPreviewDomain(bad), bad).toThrow(/preview domain/)
    expect(resolveConfig({ port: 7070 }).previewPort).toBe(7071)
    expect(resolveConfig({ port: 0 }).previewPort).toBe(0)
    expect(resolveConfig({ port: 7070, previewPort: 9000 }).previewPort).toBe(9000)
    expect(resolveConfig({}).previewDomain).toBe('localhost')
  })
})
