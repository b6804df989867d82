"""How much to draft, without torch: the interface between the step and a policy (plan.py),
fixed and adaptive k (adaptive.py), the acceptance estimator (acceptance.py), the cost
formulas (economics.py), the shape of a draft (draft_shape.py) and when to look again
(look_again.py)."""
