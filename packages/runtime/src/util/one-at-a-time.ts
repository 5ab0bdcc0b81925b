/**
 * Runs the work given under one key one after another, in the order given (a failed one does not
 * stop the next); work under other keys runs freely. A key is forgotten once its last work ends.
 */
export class OneAtATime {
  private readonly tails = new Map<string, Promise<unknown>>()

  run<T>(key: string, work: () => Promise<T>): Promise<T> {
    const before = this.tails.get(key) ?? Promise.resolve()
    const result = before.catch(() => undefined).then(work)
    this.tails.set(key, result)
    const forget = () => {
      if (this.tails.get(key) === result) this.tails.delete(key)
    }
    result.then(forget, forget)
    return result
  }
}
