import { jsonOption, type Register } from '../../command.js'
import { oneLine } from '../../format/sanitize.js'
import { renderTable } from '../../format/table.js'
import { relativeTime } from '../../format/time.js'

function mebibytes(bytes: number): string {
  return `${(bytes / 1024 / 1024).toFixed(1)} MiB`
}

export const register: Register = (parent, ctx) => {
  jsonOption(
    parent
      .command('images')
      .alias('image')
      .description(
        'List built agent images (image: in cairn.yaml): size, recipe or OCI reference and digest, and which of your revisions run on each',
      ),
  ).action(async () => {
    const list = await (await ctx.client()).images.list()
    if (ctx.json) return ctx.out.data(list)
    const fallback = `Agents without image: run on '${oneLine(list.defaultImage, 80)}'${list.defaultImage === 'host' ? " (the host's /usr, read-only)" : ''}.`
    if (list.images.length === 0) {
      ctx.out.note(`No images built yet. ${fallback}`)
      return
    }
    const now = new Date()
    const rows = list.images.map((image) => [
      image.key.slice(0, 19),
      oneLine(image.source, 60),
      image.digest.slice(0, 19),
      mebibytes(image.sizeBytes),
      relativeTime(image.builtAt, now),
      image.revisions.length === 0 ? '-' : image.revisions.map((r) => r.id).join(', '),
    ])
    ctx.out.line(renderTable(['Key', 'Source', 'Digest', 'Size', 'Built', 'Revisions'], rows, ctx.out.c.bold))
    ctx.out.note(fallback)
  })
}
