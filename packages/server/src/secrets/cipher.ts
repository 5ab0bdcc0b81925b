import { createCipheriv, createDecipheriv, createHash, hkdfSync, randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import { chmod, readFile, writeFile } from 'node:fs/promises'

export interface Sealed {
  ciphertext: Buffer
  iv: Buffer
  tag: Buffer
  keyVersion: number
}

const KEY_VERSION = 1

/** AES-256-GCM with a per-install key; the associated data binds a value to its agent and name. */
export class SecretCipher {
  private constructor(private readonly key: Buffer) {}

  /** Key from `CAIRN_SECRET_KEY` (any string, hashed to 32 bytes) or a 0600 key file created once. */
  static async load(keyFile: string, envKey = process.env.CAIRN_SECRET_KEY): Promise<SecretCipher> {
    if (envKey) return new SecretCipher(createHash('sha256').update(envKey).digest())
    if (!existsSync(keyFile)) {
      await writeFile(keyFile, randomBytes(32).toString('base64'), { mode: 0o600 })
    }
    await chmod(keyFile, 0o600)
    const key = Buffer.from((await readFile(keyFile, 'utf8')).trim(), 'base64')
    if (key.length !== 32) throw new Error(`${keyFile} does not hold a 32-byte base64 key`)
    return new SecretCipher(key)
  }

  /** A key for another purpose (signing preview URLs), derived so no second key file is needed. */
  deriveKey(purpose: string): Buffer {
    return Buffer.from(hkdfSync('sha256', this.key, Buffer.alloc(0), `cairn/${purpose}`, 32))
  }

  seal(plain: string, aad: string): Sealed {
    const iv = randomBytes(12)
    const cipher = createCipheriv('aes-256-gcm', this.key, iv)
    cipher.setAAD(Buffer.from(aad))
    const ciphertext = Buffer.concat([cipher.update(plain, 'utf8'), cipher.final()])
    return { ciphertext, iv, tag: cipher.getAuthTag(), keyVersion: KEY_VERSION }
  }

  open(sealed: Pick<Sealed, 'ciphertext' | 'iv' | 'tag'>, aad: string): string {
    const decipher = createDecipheriv('aes-256-gcm', this.key, sealed.iv)
    decipher.setAAD(Buffer.from(aad))
    decipher.setAuthTag(sealed.tag)
    return Buffer.concat([decipher.update(sealed.ciphertext), decipher.final()]).toString('utf8')
  }
}
