import { answerCommand } from './approvals.js'

export const register = answerCommand('deny')
