# A model of wip/decode-next-item-prefetch.patch's stream of K/V tiles (attention.cuh, kStages = 3):
# replays the kernel's issue / commit / wait / epilogue order for random item sequences of a CTA and
# asserts that every tile is complete in its stage when computed, that no copy lands in a stage
# still to be read, and that the epilogue's two stages hold nothing unread. python3 <this file>.
import random
K=3
def run(items, cross=True):
    # items: list of num_tiles for this CTA's items in order
    groups=[]        # list of sets of (kind, item, tile, slot) committed
    pending=[]       # current uncommitted ops
    slots={s:None for s in range(K)}   # what a slot holds: ('kv', item, tile) or None ; consumed flag
    state={}         # (item,tile)->slot
    completed=set()  # indices of groups complete
    qbuf=[None]
    def commit():
        groups.append(list(pending)); pending.clear()
    def wait(n):   # all but most recent n groups complete
        for g in range(len(groups)-n): completed.add(g)
    def group_of(op):
        for gi,g in enumerate(groups):
            if op in g: return gi
        return None
    def issue_tile(it,tile,slot):
        cur=slots[slot]
        if cur is not None: assert cur[2], f"slot {slot} overwritten before consumed: {cur} by {(it,tile)}"
        slots[slot]=[it,tile,False]; pending.append(('kv',it,tile,slot))
    def issue_q(it):
        # q buffer must be free: previous item's compute done
        assert qbuf[0] is None or qbuf[0][1], f"Q overwritten while in use {qbuf[0]}"
        qbuf[0]=[it,False]; pending.append(('q',it))
    n_items=len(items)
    idx=0
    issue_q(0); commit()
    continued=False; sb=0
    while True:
        n=items[idx]
        has2 = idx+1<n_items
        prefetch = cross and has2 and items[idx+1]>0
        def issue_pos(pos):
            if pos<n: issue_tile(idx,pos,(sb+pos)%K)
            elif prefetch and pos==n: issue_tile(idx+1,0,(sb+pos)%K)
        for s in range(K-1):
            if not (continued and s==0):
                issue_pos(s); commit()
        for t in range(n):
            wait(K-2)
            # sync: then issue
            issue_pos(t+K-1); commit()
            # compute tile t: its group and Q group complete
            slot=(sb+t)%K
            assert slots[slot] is not None and slots[slot][0]==idx and slots[slot][1]==t, f"slot {slot} holds {slots[slot]} not {(idx,t)}"
            g=group_of(('kv',idx,t,slot)); assert g in completed, f"tile {(idx,t)} not complete"
            gq=group_of(('q',idx)); assert gq in completed, f"Q {idx} not complete at tile {t}"
            slots[slot][2]=True
        if (not cross) or n==0: wait(0)
        # Q consumed
        qbuf[0][1]=True
        sb_next=(sb+n)%K if prefetch else sb
        if prefetch:
            issue_q(idx+1); commit()
        # epilogue uses slots sb_next+1, sb_next+2 : must hold nothing in flight/unconsumed
        for e in ((sb_next+1)%K,(sb_next+2)%K):
            cur=slots[e]
            if cur is not None:
                assert cur[2], f"epilogue slot {e} holds unconsumed {cur}"
                # in flight? consumed implies complete
        # epilogue clobbers these slots
        for e in ((sb_next+1)%K,(sb_next+2)%K): slots[e]=None
        continued=prefetch
        if prefetch:
            sb=sb_next; idx+=1
        else:
            idx+=1
            if idx>=n_items: break
            sb=0; 
            # all slots must be free of in-flight data
            for s_,cur in slots.items(): assert cur is None or cur[2], f"fresh start with {cur} in slot {s_}"
            slots={s:None for s in range(K)}
            issue_q(idx); commit()
    return True
random.seed(1)
cnt=0
for trial in range(20000):
    m=random.randint(1,6)
    items=[random.choice([0,1,2,3,4,5,7,8,16]) for _ in range(m)]
    for cross in (True,False):
        run(items,cross); cnt+=1
print("ok", cnt)
