"""Experiments that ship with ctl; each module holds one gin-registered Task."""
